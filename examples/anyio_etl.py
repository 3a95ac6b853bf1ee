"""An anyio pipeline through memory object streams, on either of anyio's backends.

``asyncflow run`` instruments every memory object stream the program creates, as it does
asyncio queues; on the trio backend it watches trio's loop too.

    asyncflow run examples/anyio_etl.py            # asyncio
    asyncflow run examples/anyio_etl.py trio
"""

from __future__ import annotations

import sys

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream


async def extract(send: MemoryObjectSendStream[int]) -> None:
    async with send:
        for row in range(200):
            await send.send(row)


async def transform(
    receive: MemoryObjectReceiveStream[int], send: MemoryObjectSendStream[int]
) -> None:
    async with receive, send:
        async for row in receive:
            await anyio.sleep(0.001)  # the slow stage
            await send.send(row * 10)


async def load(receive: MemoryObjectReceiveStream[int], out: list[int]) -> None:
    async with receive:
        async for row in receive:
            out.append(row)


async def main() -> None:
    rows, rows_out = anyio.create_memory_object_stream[int](10)
    done, done_out = anyio.create_memory_object_stream[int](10)
    out: list[int] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(extract, rows)
        tg.start_soon(transform, rows_out, done)
        tg.start_soon(load, done_out, out)
    print(f"loaded {len(out)} rows")


if __name__ == "__main__":
    anyio.run(main, backend=sys.argv[1] if len(sys.argv) > 1 else "asyncio")
