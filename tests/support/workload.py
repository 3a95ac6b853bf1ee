"""A workload whose run fills every list: futures, a queue, a memory stream, an async
generator, an executor and a lock."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio

import asyncflow


@asyncflow.future(name="produce")
async def produce(q: asyncio.Queue[int], n: int) -> None:
    for i in range(n):
        await q.put(i)


@asyncflow.future(name="consume")
async def consume(q: asyncio.Queue[int], n: int) -> int:
    total = 0
    for _ in range(n):
        total += await q.get()
    return total


@asyncflow.stream(name="numbers")
async def numbers(n: int) -> Any:
    for i in range(n):
        yield i


async def workload() -> None:
    """Futures, a queue, a memory stream and an async generator: every list gets entries."""
    q: asyncio.Queue[int] = asyncflow.instrument_queue(asyncio.Queue(maxsize=2), name="work")
    await asyncio.gather(produce(q, 20), consume(q, 20))
    send, receive = asyncflow.instrument_memory_stream(
        *anyio.create_memory_object_stream[int](1), name="mem"
    )
    async with send, receive:
        await send.send(1)
        await receive.receive()
    async for _ in numbers(5):
        pass
    with asyncflow.instrument_executors():
        await asyncio.to_thread(sum, [1, 2])
    gate = asyncflow.instrument_lock(asyncio.Lock(), name="gate")
    async with gate:
        pass
