"""Orders, each checked then priced, through a queue: a program to compare with asyncflow diff.

ORDERS_SLOW (a factor, 1 by default) makes pricing that many times slower, as a change to
the program might.

    asyncflow run --format json --output base.json orders.py
    ORDERS_SLOW=4 asyncflow run --format json --output new.json orders.py
    asyncflow diff base.json new.json
"""

from __future__ import annotations

import asyncio
import os

ORDERS = 24
SLOW = float(os.environ.get("ORDERS_SLOW", "1"))


async def check(order: int) -> int:
    await asyncio.sleep(0.01)
    return order


async def price(order: int) -> int:
    await asyncio.sleep(0.01 * SLOW)
    return order * 2


async def clerk(orders: asyncio.Queue[int | None]) -> int:
    total = 0
    while (order := await orders.get()) is not None:
        await check(order)
        total += await price(order)
    return total


async def main() -> None:
    orders: asyncio.Queue[int | None] = asyncio.Queue(maxsize=2)
    clerk_task = asyncio.create_task(clerk(orders))
    for order in range(ORDERS):
        await orders.put(order)
    await orders.put(None)
    print(f"total {await clerk_task}")


asyncio.run(main())
