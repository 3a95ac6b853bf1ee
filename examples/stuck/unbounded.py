"""An ingest service whose events arrive faster than the indexer writes them, through an
unbounded queue: the queue grows and each event waits longer, and nothing pushes back."""

from __future__ import annotations

import asyncio


async def ingest(events: asyncio.Queue[int], seconds: float) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    n = 0
    while loop.time() < end:
        for _ in range(20):  # a batch of events from the network
            await events.put(n)
            n += 1
        await asyncio.sleep(0.002)


async def index(events: asyncio.Queue[int]) -> None:
    while True:
        await events.get()
        await asyncio.sleep(0.001)  # write to the search index


async def main() -> None:
    events: asyncio.Queue[int] = asyncio.Queue()
    indexer = asyncio.create_task(index(events))
    await ingest(events, 2.0)
    print(f"{events.qsize()} events not yet indexed", flush=True)
    indexer.cancel()


if __name__ == "__main__":
    asyncio.run(main())
