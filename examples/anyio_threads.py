"""Order enrichment with anyio, on either backend: a synchronous CRM client, run in worker
threads behind a capacity limiter of 2, shared by 8 enrichment tasks.

    asyncflow run examples/anyio_threads.py trio
"""

import sys
import time

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

CRM = anyio.CapacityLimiter(2)


def crm_lookup(customer: int) -> str:
    time.sleep(0.005)  # the CRM's SDK is synchronous
    return "vip" if customer % 7 == 0 else "retail"


async def customer_segment(customer: int) -> str:
    return await anyio.to_thread.run_sync(crm_lookup, customer, limiter=CRM)


async def enrich(orders: MemoryObjectReceiveStream[int], out: list[tuple[int, str]]) -> None:
    async with orders:
        async for order in orders:
            out.append((order, await customer_segment(order)))


async def main() -> None:
    send, receive = anyio.create_memory_object_stream[int](10)
    enriched: list[tuple[int, str]] = []
    async with anyio.create_task_group() as tg:
        for _ in range(8):
            tg.start_soon(enrich, receive.clone(), enriched)
        receive.close()
        async with send:
            for order in range(100):
                await send.send(order)
    print(f"enriched {len(enriched)} orders")


anyio.run(main, backend=sys.argv[1] if len(sys.argv) > 1 else "asyncio")
