"""Message lineage on the hot path: chains followed across asyncio queues and anyio memory
streams, ``derive()`` for a hand-off the inference cannot see, clear errors, bounded tables."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import pytest

import asyncflow
from asyncflow.instrumentation import lineage
from asyncflow.schema import LineagePath, Snapshot

MESSAGES = 30


def _paths(snap: Snapshot) -> dict[str, LineagePath]:
    assert snap.flow is not None
    return {p.label: p for p in snap.flow.lineage}


async def test_a_hand_off_to_another_task_is_followed_once_derived(
    prof: asyncflow.Profiler,
) -> None:
    raw = asyncflow.instrument_queue(asyncio.Queue[dict[str, int]](), name="raw")
    parsed = asyncflow.instrument_queue(asyncio.Queue[dict[str, int]](), name="parsed")
    linked: list[bool] = []
    moved_on: list[asyncio.Event] = []  # per message: parse has received the next one

    @asyncflow.future(name="src")
    async def src() -> None:
        for i in range(MESSAGES):
            await asyncio.sleep(0.002)  # a quiet channel: every message is timed
            await raw.put({"n": i})

    @asyncflow.future(name="work")
    async def work(msg: dict[str, int], derived: bool) -> None:
        await moved_on[msg["n"]].wait()  # parse received the next one: this one's chain ended
        out = {"n": msg["n"] * 2}
        if derived:
            lineage.fold()  # the collector's drain may fold the ended chain before derive()
            linked.append(asyncflow.derive(msg, out))
        await parsed.put(out)

    @asyncflow.future(name="parse")
    async def parse(derived: bool) -> None:
        moved_on[:] = [asyncio.Event() for _ in range(MESSAGES)]
        async with asyncio.TaskGroup() as tg:
            for i in range(MESSAGES):
                msg = await raw.get()
                if i:
                    moved_on[i - 1].set()
                tg.create_task(work(msg, derived))  # another task sends it on
            moved_on[-1].set()

    @asyncflow.future(name="sink")
    async def sink() -> list[int]:
        return [(await parsed.get())["n"] for _ in range(MESSAGES)]

    with anyio.fail_after(10):
        _, _, got = await asyncio.gather(src(), parse(False), sink())
    assert got == [2 * i for i in range(MESSAGES)]
    paths = _paths(prof.snapshot())
    assert "src → parse → sink" not in paths  # not seen: parse never sends
    assert "work → sink" in paths
    ended_at_parse = paths["src → parse"].messages  # each that parse received the next after
    assert ended_at_parse >= MESSAGES - 2

    with anyio.fail_after(10):
        await asyncio.gather(src(), parse(True), sink())
    assert linked and all(linked)
    paths = _paths(prof.snapshot())
    path = paths["src → parse → work → sink"]  # parse received it, work sent it on
    assert path.stages == ["src", "parse → work", "sink"]
    assert path.channels == ["raw", "parsed"]
    # each message once: the way that parse ended when it received the next one (it did not
    # send it on itself) goes on in the derived message instead, not in both
    assert MESSAGES - 1 <= path.messages <= MESSAGES
    # the first round's only, though each chain was folded before its copy went on
    assert paths["src → parse"].messages == ended_at_parse


async def test_derive_refuses_what_cannot_stand_for_a_message(prof: asyncflow.Profiler) -> None:
    item = {"a": 1}
    with pytest.raises(ValueError, match="same object"):
        asyncflow.derive(item, item)
    for bad in (None, True, 3):
        with pytest.raises(TypeError, match="msg_from is"):
            asyncflow.derive(bad, item)
        with pytest.raises(TypeError, match="msg_to is"):
            asyncflow.derive(item, bad)
    assert asyncflow.derive(item, {"b": 2}) is False  # never received through a channel


def test_derive_without_a_profiler_links_nothing() -> None:
    assert asyncflow.derive(["from"], ["to"]) is False


def test_derive_refuses_a_wrong_argument_without_a_profiler_too() -> None:
    """A wrong argument is the program's error whether or not a profiler runs: found when it
    is written, not first in production under the profiler."""
    item = {"a": 1}
    with pytest.raises(TypeError, match="msg_from is None"):
        asyncflow.derive(None, item)
    with pytest.raises(TypeError, match="msg_to is 3"):
        asyncflow.derive(item, 3)
    with pytest.raises(ValueError, match="same object"):
        asyncflow.derive(item, item)


async def test_anyio_memory_streams_are_followed(prof: asyncflow.Profiler) -> None:
    send1, recv1 = asyncflow.instrument_memory_stream(
        *anyio.create_memory_object_stream[int](10), name="first"
    )
    send2, recv2 = asyncflow.instrument_memory_stream(
        *anyio.create_memory_object_stream[int](10), name="second"
    )
    got: list[int] = []

    @asyncflow.future(name="produce")
    async def produce() -> None:
        async with send1:
            for i in range(MESSAGES):
                await anyio.sleep(0.002)
                await send1.send(i)

    @asyncflow.future(name="double")
    async def double() -> None:
        async with recv1, send2:
            async for i in recv1:
                await send2.send(2 * i)

    @asyncflow.future(name="collect")
    async def collect() -> None:
        async with recv2:
            async for i in recv2:
                got.append(i)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(produce)
            tg.start_soon(double)
            tg.start_soon(collect)
    assert got == [2 * i for i in range(MESSAGES)]
    path = _paths(prof.snapshot())["produce → double → collect"]
    assert path.channels == ["first", "second"]
    assert path.messages >= MESSAGES - 2


async def test_the_tables_stay_bounded(prof: asyncflow.Profiler) -> None:
    """Messages sent and never received, holders that never send on, paths without end: every
    table stops at its bound, and what it let go is counted."""
    queues = [
        asyncflow.instrument_queue(asyncio.Queue[Any](), name=f"q{i}")
        for i in range(lineage.MAX_PATHS + 5)
    ]
    for i in range(lineage.MAX_IN_FLIGHT + 50):
        queues[0].put_nowait(object())  # never received
        if i % 64 == 0:
            await asyncio.sleep(0.002)
    holders = []

    async def take(q: asyncio.Queue[Any]) -> None:
        q.get_nowait()  # received, never sent on: held open until the bound

    for i in range(lineage.MAX_OPEN + 50):
        q = queues[1 + i % (len(queues) - 1)]
        q.put_nowait([i])
        holders.append(asyncio.create_task(take(q)))
        if i % 64 == 0:
            await asyncio.sleep(0.002)
    await asyncio.gather(*holders)
    sizes = lineage.sizes()
    assert sizes["in_flight"] <= lineage.MAX_IN_FLIGHT
    assert sizes["open"] <= lineage.MAX_OPEN
    assert sizes["sent_items"] <= lineage.MAX_ITEMS
    assert sizes["received_items"] <= lineage.MAX_ITEMS
    snap = prof.snapshot()
    assert lineage.sizes()["paths"] <= lineage.MAX_PATHS
    assert snap.flow is not None and snap.flow.lineage_dropped > 0


async def test_a_streams_items_begin_a_way(prof: asyncflow.Profiler) -> None:
    """An ``asyncflow.stream``'s item, sent on by its consumer: the stream is the path's source,
    and the time its consumer waited for the item is the first hop."""
    out = asyncflow.instrument_queue(asyncio.Queue[int](), name="out")

    @asyncflow.stream(name="numbers")
    async def numbers() -> Any:
        for i in range(MESSAGES):
            await asyncio.sleep(0.002)
            yield i

    @asyncflow.future(name="double")
    async def double() -> None:
        async for i in numbers():
            await out.put(2 * i)
        await out.put(-1)

    @asyncflow.future(name="sink")
    async def sink() -> list[int]:
        got = []
        while (i := await out.get()) >= 0:
            got.append(i)
        return got

    with anyio.fail_after(10):
        _, got = await asyncio.gather(double(), sink())
    assert got == [2 * i for i in range(MESSAGES)]
    path = _paths(prof.snapshot())["numbers → double → sink"]
    assert path.channels == ["numbers", "out"]
    assert path.messages >= MESSAGES - 2
    assert path.slowest[0].hops[0].duration_ns >= 1_000_000  # it waited for the item's sleep
