"""anyio memory object streams and an async generator, profiled by asyncflow.

A producer sends readings through a small memory object stream to two consumers (clones of the
receive side); an async generator smooths the readings before they are sent.

    python examples/memory_stream.py
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

import asyncflow


@asyncflow.stream(name="smoothed readings")
async def smoothed(count: int) -> AsyncIterator[float]:
    """A moving average over simulated sensor readings."""
    window: list[float] = []
    for i in range(count):
        await anyio.sleep(0)
        window = [*window[-3:], float(i % 7)]
        yield sum(window) / len(window)


@asyncflow.future
async def produce(send: MemoryObjectSendStream[float], count: int) -> None:
    async with send:
        async for value in smoothed(count):
            await send.send(value)


@asyncflow.future
async def consume(receive: MemoryObjectReceiveStream[float], totals: list[float]) -> None:
    async with receive:
        async for value in receive:
            await anyio.sleep(0.0001)  # slower than the producer: the stream fills up
            totals.append(value)


async def main(count: int = 300) -> int:
    send, receive = asyncflow.instrument_memory_stream(
        *anyio.create_memory_object_stream[float](4), name="readings"
    )
    totals: list[float] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(produce, send, count)
        for _ in range(2):
            tg.start_soon(consume, receive.clone(), totals)
        receive.close()
    return len(totals)


if __name__ == "__main__":
    with asyncflow.profile("memory-stream"):
        received = anyio.run(main)
    print(f"received {received} readings", flush=True)
