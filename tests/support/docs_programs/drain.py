"""A queue full for its first two seconds, then drained (docs/record.md, issue 29)."""

import asyncio


async def main() -> None:
    queue: asyncio.Queue[int] = asyncio.Queue(maxsize=200)
    for i in range(200):
        queue.put_nowait(i)
    await asyncio.sleep(2.0)  # its consumer starts late: the queue stays full meanwhile
    while not queue.empty():
        queue.get_nowait()
        await asyncio.sleep(0)


asyncio.run(main())
