"""An order service that tells the warehouse about each order in a task it starts and forgets
(``asyncio.ensure_future``), then waits in that task for the warehouse's acknowledgement. The
acknowledgements wait in a registry that holds them weakly, so that a lost one cannot leak. But
nothing else holds those tasks either: the loop keeps only a weak reference to a task. When an
acknowledgement is lost, its task is garbage-collected in the middle of its wait, and the
retry after it never runs: the order is silently never shipped."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

#: acknowledgements not received yet, by order (weakly: a lost one must not leak)
PENDING: weakref.WeakValueDictionary[int, asyncio.Future[str]] = weakref.WeakValueDictionary()
SHIPPED: list[int] = []


async def send_to_warehouse(order: dict[str, Any]) -> None:
    await asyncio.sleep(0.001)  # the request to the warehouse
    if order["id"] % 5:  # one acknowledgement in five is lost on the way back
        asyncio.get_running_loop().call_later(0.002, acknowledge, order["id"])


def acknowledge(order_id: int) -> None:
    ack = PENDING.get(order_id)
    if ack is not None and not ack.done():
        ack.set_result("ok")


async def notify_warehouse(order: dict[str, Any]) -> None:
    ack: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    PENDING[order["id"]] = ack
    await send_to_warehouse(order)
    await ack  # (the retry on a lost acknowledgement would go here: it never runs)
    SHIPPED.append(order["id"])


async def place_order(order_id: int) -> None:
    order = {"id": order_id, "lines": [{"sku": f"sku-{n}", "qty": 1} for n in range(40)]}
    await asyncio.sleep(0.001)  # write the order
    asyncio.ensure_future(notify_warehouse(order))  # noqa: RUF006  (the planted bug: kept by nothing)


async def serve(seconds: float) -> int:
    loop = asyncio.get_running_loop()
    until = loop.time() + seconds
    order_id = 0
    while loop.time() < until:
        await place_order(order_id)
        order_id += 1
        await asyncio.sleep(0.002)
    return order_id


async def collect_garbage() -> None:
    """A service that runs for hours has its old garbage collected now and then; this one runs for
    seconds, so it collects all of it each half second (as some services do in idle time). The
    collector's own passes take the young only, and only when enough was made meanwhile."""
    while True:
        await asyncio.sleep(0.5)
        gc.collect()


async def main() -> None:
    housekeeping = asyncio.create_task(collect_garbage())
    placed = await serve(2.5)
    housekeeping.cancel()
    await asyncio.sleep(0.05)
    print(f"placed {placed} orders, shipped {len(SHIPPED)}", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
