"""A metrics relay whose only producer dies on a malformed reading (a ValueError nobody
retrieves): the consumer then waits on the empty queue for readings that never come, until
main gives up after 1.5 s."""

from __future__ import annotations

import asyncio

FEED = [f"cpu={n % 100}" for n in range(60)] + ["cpu=??"] + [f"cpu={n}" for n in range(40)]


async def read_feed(readings: asyncio.Queue[int]) -> None:
    for line in FEED:
        await readings.put(int(line.removeprefix("cpu=")))  # "??" raises ValueError
        await asyncio.sleep(0.001)
    await readings.put(-1)  # the end of the feed


async def relay(readings: asyncio.Queue[int], sent: list[int]) -> None:
    while (value := await readings.get()) != -1:
        sent.append(value)


async def main() -> None:
    readings: asyncio.Queue[int] = asyncio.Queue(10)
    sent: list[int] = []
    producer = asyncio.create_task(read_feed(readings))
    try:
        await asyncio.wait_for(relay(readings, sent), timeout=1.5)
    except TimeoutError:
        print(f"gave up after {len(sent)} readings: the relay is waiting", flush=True)
    del producer


if __name__ == "__main__":
    asyncio.run(main())
