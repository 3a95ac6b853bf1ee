"""A price cache that refreshes each region in a background task it keeps (to cancel them at
shutdown) and never awaits: one region's refresh fails on a malformed row (a ValueError nobody
retrieves), so that region's prices silently stop updating while the service runs on."""

from __future__ import annotations

import asyncio

REGIONS = ("us-east", "us-west", "eu-west", "ap-south")


async def fetch_prices(region: str, page: int) -> dict[str, float]:
    await asyncio.sleep(0.001)  # the upstream call
    row = "12.5" if region != "eu-west" or page < 3 else "12,5"  # a malformed row on page 3
    return {"widget": float(row)}


async def refresh(region: str, cache: dict[str, dict[str, float]], every_s: float) -> None:
    page = 0
    while True:
        cache[region] = await fetch_prices(region, page)
        page += 1
        await asyncio.sleep(every_s)


async def serve(cache: dict[str, dict[str, float]], seconds: float) -> int:
    served = 0
    loop = asyncio.get_running_loop()
    until = loop.time() + seconds
    while loop.time() < until:
        await asyncio.sleep(0.005)  # a request reads the cache
        served += len(cache)
    return served


async def main() -> None:
    cache: dict[str, dict[str, float]] = {}
    refreshers = {r: asyncio.create_task(refresh(r, cache, 0.01)) for r in REGIONS}
    served = await serve(cache, 2.5)
    print(f"served {served} reads", flush=True)
    for task in refreshers.values():
        task.cancel()  # a task that already ended is left as it is: its exception too


if __name__ == "__main__":
    asyncio.run(main())
