"""An order pipeline whose only consumer dies on a malformed order (a KeyError nobody
retrieves): the producer then blocks on the full queue until main gives up after 1.5 s."""

from __future__ import annotations

import asyncio


async def consume(orders: asyncio.Queue[dict[str, int]], totals: list[int]) -> None:
    while True:
        order = await orders.get()
        totals.append(order["price"] * order["quantity"])  # order 37 has no price
        orders.task_done()


async def produce(orders: asyncio.Queue[dict[str, int]], count: int) -> None:
    for i in range(count):
        order = {"id": i, "quantity": 1} | ({} if i == 37 else {"price": 10})
        await orders.put(order)
        await asyncio.sleep(0.001)


async def main() -> None:
    orders: asyncio.Queue[dict[str, int]] = asyncio.Queue(10)
    totals: list[int] = []
    consumer = asyncio.create_task(consume(orders, totals))
    try:
        await asyncio.wait_for(produce(orders, 500), timeout=1.5)
    except TimeoutError:
        print(f"gave up after {len(totals)} orders: the producer is stuck", flush=True)
    del consumer


if __name__ == "__main__":
    asyncio.run(main())
