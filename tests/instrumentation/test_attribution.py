"""Which call sent or received a message: the innermost tracked call running, however started.

A tracked producer and consumer are started as anyio's task group does it (``start_soon``,
``start``: the task's own coroutine is anyio's wrapper around them on some versions), as
``asyncio.TaskGroup`` and ``create_task`` do, or awaited through ``wait_for``, ``timeout``,
``gather`` or another tracked call. Whatever wraps them, the sender and receiver edges of the
channel (an asyncio queue, an anyio memory stream) name them, on both hot paths.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import anyio
import pytest

import asyncflow
from asyncflow.schema import Snapshot

pytestmark = pytest.mark.anyio

Send = Callable[[int], Awaitable[None]]
Receive = Callable[[], Awaitable[int | None]]
Body = Callable[..., Coroutine[Any, Any, None]]
Start = Callable[[Body, Body], Awaitable[None]]

ITEMS = 4


async def _start_soon(producer: Body, consumer: Body) -> None:
    async with anyio.create_task_group() as tg:
        tg.start_soon(consumer)
        tg.start_soon(producer)


async def _start(producer: Body, consumer: Body) -> None:
    async with anyio.create_task_group() as tg:
        await tg.start(consumer)
        await tg.start(producer)


async def _task_group(producer: Body, consumer: Body) -> None:
    async with asyncio.TaskGroup() as tg:
        tg.create_task(consumer())
        tg.create_task(producer())


async def _create_task(producer: Body, consumer: Body) -> None:
    await asyncio.gather(asyncio.create_task(consumer()), asyncio.create_task(producer()))


async def _wrapped(producer: Body, consumer: Body) -> None:
    """Each awaited by an untracked task through asyncio's own wrappers."""

    async def in_timeout() -> None:
        async with asyncio.timeout(5):
            await producer()

    await asyncio.gather(asyncio.wait_for(consumer(), 5), asyncio.create_task(in_timeout()))


async def _nested(producer: Body, consumer: Body) -> None:
    """Each awaited by a tracked call of another future: the inner call sends and receives."""

    @asyncflow.future(name="attribution-outer")
    async def outer(body: Body) -> None:
        await body()

    async with anyio.create_task_group() as tg:
        tg.start_soon(outer, consumer)
        tg.start_soon(outer, producer)


STARTS: dict[str, Start] = {
    "start_soon": _start_soon,
    "start": _start,
    "asyncio.TaskGroup": _task_group,
    "create_task": _create_task,
    "wait_for+timeout+gather": _wrapped,
    "nested tracked call": _nested,
}


def _queue(label: str) -> tuple[Send, Receive]:
    q = asyncflow.instrument_queue(asyncio.Queue[int | None](1), name=label)
    return q.put, q.get


def _stream(label: str) -> tuple[Send, Receive]:
    send, receive = asyncflow.instrument_memory_stream(
        *anyio.create_memory_object_stream[int](1), name=label
    )

    async def put(item: int) -> None:
        if item < 0:
            await send.aclose()
        else:
            await send.send(item)

    async def get() -> int | None:
        try:
            return await receive.receive()
        except anyio.EndOfStream:
            receive.close()
            return None

    return put, get


async def _run(
    label: str, start: Start, channel: Callable[[str], tuple[Send, Receive]]
) -> Snapshot:
    with asyncflow.profile(label, format="none", sampling=1) as prof:
        put, get = channel(label)
        got: list[int] = []

        @asyncflow.future(name=f"{label}-producer")
        async def producer(
            *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
        ) -> None:
            task_status.started()
            for i in range(ITEMS):
                await put(i)
            await put(-1)  # the end: None on a queue, closing the stream

        @asyncflow.future(name=f"{label}-consumer")
        async def consumer(
            *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
        ) -> None:
            task_status.started()
            while (item := await get()) is not None and item >= 0:
                got.append(item)

        with anyio.fail_after(5):
            await start(producer, consumer)
        assert got == list(range(ITEMS))
        return prof.snapshot()


@pytest.mark.parametrize("channel", [_queue, _stream], ids=["queue", "memory-stream"])
@pytest.mark.parametrize("how", list(STARTS))
async def test_sender_and_receiver_edges_name_the_tracked_calls(
    how: str, channel: Callable[[str], tuple[Send, Receive]]
) -> None:
    label = f"attribution-{how}-{channel.__name__}"
    snap = await _run(label, STARTS[how], channel)
    ids = {f.label: f.id for f in snap.futures.futures}
    producer, consumer = ids[f"{label}-producer"], ids[f"{label}-consumer"]
    assert snap.channels is not None
    (entry,) = [c for c in snap.channels.channels if c.label == label]
    (logs,) = [log for log in snap.channel_logs if log.channel_id == entry.id]
    assert logs.sent_logs and logs.received_logs
    assert {e.future_id for e in logs.sent_logs} == {producer}
    assert {e.future_id for e in logs.received_logs} == {consumer}
    producer_calls = {
        c.call_id for log in snap.future_logs if log.future_id == producer for c in log.calls
    }
    assert {e.call_id for e in logs.sent_logs} <= producer_calls
    assert snap.flow is not None
    edges = {(e.source, e.target) for e in snap.flow.edges}
    node = f"channel:{entry.id}"
    assert (f"future:{producer}", node) in edges
    assert (node, f"future:{consumer}") in edges
    assert not {(s, t) for s, t in edges if node in (s, t)} - {
        (f"future:{producer}", node),
        (node, f"future:{consumer}"),
    }


async def _run_on_a_lock(label: str, start: Start) -> Snapshot:
    with asyncflow.profile(label, format="none", sampling=1) as prof:
        lock = asyncflow.instrument_lock(asyncio.Lock(), name=label)

        async def take_turns() -> None:
            for _ in range(ITEMS):
                async with lock:  # the other waits: contended acquisitions, waits and holds
                    await asyncio.sleep(0)

        @asyncflow.future(name=f"{label}-producer")
        async def producer(
            *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
        ) -> None:
            task_status.started()
            await take_turns()

        @asyncflow.future(name=f"{label}-consumer")
        async def consumer(
            *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
        ) -> None:
            task_status.started()
            await take_turns()

        with anyio.fail_after(5):
            await start(producer, consumer)
        return prof.snapshot()


@pytest.mark.parametrize("how", list(STARTS))
async def test_waits_and_holds_of_a_lock_name_the_tracked_calls(how: str) -> None:
    # As channels do: the innermost tracked call running, not the task's own coroutine (anyio's
    # wrapper, wait_for's, or a tracked caller's), is the one that waits and holds.
    label = f"attribution-lock-{how}"
    snap = await _run_on_a_lock(label, STARTS[how])
    ids = {f.label: f.id for f in snap.futures.futures}
    producer, consumer = ids[f"{label}-producer"], ids[f"{label}-consumer"]
    assert snap.resources is not None
    (entry,) = [r for r in snap.resources.resources if r.label == label]
    assert entry.acquisitions == 2 * ITEMS
    by_future = {f.future_id: f for f in entry.futures}
    assert set(by_future) == {producer, consumer}, by_future  # nobody untracked
    assert sum(f.holds for f in entry.futures) == 2 * ITEMS
    assert all(f.holds == ITEMS for f in entry.futures)


async def test_anyio_tasks_are_named_by_the_coroutine_the_program_gave() -> None:
    # anyio 4.14 and later run each task group task as TaskHandle._run_coro(), awaiting the
    # program's coroutine: whole-program mode names the task by the program's function (not
    # every anyio task as one `TaskHandle._run_coro`), and a decorated one is tracked once.
    async def crawl(n: int) -> None:
        await asyncio.sleep(0)

    @asyncflow.future(name="index")
    async def index(n: int) -> None:
        await asyncio.sleep(0)

    with asyncflow.profile("anyio-names", format="none", port=None) as prof:
        with asyncflow.instrument_tasks():
            async with anyio.create_task_group() as tg:
                for n in range(3):
                    tg.start_soon(crawl, n)
                    tg.start_soon(index, n)
        snap = prof.snapshot()
    calls = {f.label: f.call_count for f in snap.futures.futures}
    label = "test_anyio_tasks_are_named_by_the_coroutine_the_program_gave.<locals>.crawl"
    assert calls[label] == 3 and calls["index"] == 3, calls
    assert not any("_run_coro" in label for label in calls), calls


async def test_anyio_still_refuses_what_it_refused_without_asyncflow() -> None:
    # asyncflow lets anyio 4.4-4.13's task group accept a tracked call; anything else it
    # refused (a function that returns no coroutine) it refuses as before, with its own error.
    def not_async() -> int:
        return 1

    async def refused() -> str:
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(not_async)  # type: ignore[arg-type]
        except BaseException as exc:  # (a TypeError, or a group holding one, by version)
            return f"{type(exc).__name__}: {exc}"
        return "accepted"

    plain = await refused()

    @asyncflow.future(name="tracked")  # asks for the adaptation of anyio's check
    async def tracked() -> None:
        await asyncio.sleep(0)

    with asyncflow.profile("refused", format="none", port=None):
        async with anyio.create_task_group() as tg:
            tg.start_soon(tracked)
        observed = await refused()
    assert plain != "accepted" and observed == plain
